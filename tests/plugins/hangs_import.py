"""A plugin that hangs while it is imported (a module-level network call that never
returns). Operator commands must not care: they never import the plugin."""

import threading

threading.Event().wait()  # forever
