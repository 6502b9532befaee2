"""Model servers: the endpoint registry, /metrics scraping, and the one parser that knows ``vllm:*`` names."""
