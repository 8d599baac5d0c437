"""Local services for development, the demo and the tests: Kafka (KRaft), Redis, worker processes."""
