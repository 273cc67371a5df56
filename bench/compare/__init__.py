"""podshim beside containerd on the same sandbox cycle (run.py) and its batches."""
