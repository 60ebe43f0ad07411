"""Tests of deployments/: the Prefect deployments registered and run by real workers."""
