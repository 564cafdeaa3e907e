"""Small drivers that run the bench workloads on peers (installed in .venv-peers) and a floor."""
