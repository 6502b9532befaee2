"""OpenAI body parsing, chat-template rendering and tokenization, exactly as vLLM does them."""
