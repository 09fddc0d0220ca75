"""The on-disk layout: the only code that knows a workspace's folder and file names."""
