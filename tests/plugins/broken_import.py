"""A plugin from a bad deploy: importing it fails. Operator commands must not care (they
never import the plugin); `ringmaster run` and `check` exit 3."""

raise RuntimeError("a bad deploy: this plugin does not import")
