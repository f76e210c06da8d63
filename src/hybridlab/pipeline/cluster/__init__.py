"""Cluster planning: per job, the GPUs (memory plan), host memory, disk and time it asks for, and how it is launched."""
