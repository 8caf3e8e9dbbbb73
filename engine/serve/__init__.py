"""The parts behind the ChatEngine facade (engine/chat_engine.py), one job each: the pair's lifecycle
(pair_slot.py), the model lock and its error mapping (model_lock.py), generation with the cache in front
(generation.py) and the proofs on the loaded pair (proofs.py)."""
