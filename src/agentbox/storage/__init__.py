"""Where snapshots are kept (a folder or an S3 bucket), and the secret scan before one."""
