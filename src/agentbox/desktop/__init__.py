"""Desktop mode: a virtual X display with a VNC server inside a sandbox (manager),
and what the desktop tools run there (actions)."""
