"""Named cache volumes: filesystems that outlive sandboxes, on a disk of their own.

A volume is a sparse ext4 image of its size (its quota) in the volumes directory
(``volumes.dir`` of the gateway config or ``$AGENTBOX_VOLUMES_DIR``, which may be another
disk), mounted nosuid,nodev on the host under ``$AGENTBOX_HOME/volumes/mnt/NAME`` and bound
into sandboxes at the paths their spec names: read-write for one sandbox at a time or
read-only for many. Its record and who mounts it live in ``state.db`` beside the
sandboxes, so a daemon killed with SIGKILL loses nothing; recovery mounts them again.

    spec      the ``volumes`` entries of a sandbox spec (name, path, mode), checked
    store     the records: volumes and their mounts
    image     one volume's image: format, mount, usage, handing its tree to a sandbox
    service   create / list / remove, attach to and detach from sandboxes, recovery
"""
