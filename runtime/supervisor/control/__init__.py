"""What an operator asks of a running daemon, and how it is applied.

    signals.py     what each signal asks for (an intent the loop hands on); handlers only enqueue
    commands.py    the control socket's requests and SIGHUP/SIGTTIN/SIGTTOU, one at a time
    rollout.py     reload (new plugin code, canary, one worker at a time) and resize
    operator.py    operator pauses (the control topic) applied to this member's partitions

Runs in: supervisor. May import: the data path, the workers' rooms and the seams; never the
group's rooms or the wiring above it.
"""
