"""Every wire format, sans-IO: typed messages parsed and validated at the edge, never raw dicts
past it. Nothing here imports the rest of the package."""
