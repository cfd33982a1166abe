"""What signaling replicas share: the registry of workers, slots and the queue, the message bus
and the session store, in memory (one replica) or on Redis (several)."""
