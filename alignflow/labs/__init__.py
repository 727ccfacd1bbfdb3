"""Labs: infrastructure that runs a real framework on hardware it was not built for (tests and CPU runs only)."""
