"""CPU-side KV-cache managers: block allocator/manager, token pool, radix prefix cache."""
