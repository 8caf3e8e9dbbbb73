"""The semantic cache in front of the engine: storage, embedder, guards, and how a chat uses it."""
