"""``python -m runtime.cli``: the ``ringmaster`` command (a member of ``run --members`` is
started so)."""

from runtime.cli import main

main()
