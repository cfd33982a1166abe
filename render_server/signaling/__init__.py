"""The signaling server: pairs browsers with worker slots and relays their negotiation."""
