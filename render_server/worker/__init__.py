"""The worker: sessions that render, encode and stream to one browser each."""
