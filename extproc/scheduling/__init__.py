"""The decision: filters → estimates/scorers → pick. Pure, synchronous functions of frozen inputs."""
