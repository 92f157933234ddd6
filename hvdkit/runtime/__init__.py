"""What runs inside every rank, written against the backend protocol (runtime/backend.py).
Imports no framework at import time."""
