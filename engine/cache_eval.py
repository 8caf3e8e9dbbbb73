"""``python -m engine.cache_eval`` — kept as the command's name; the code lives in engine/cache/eval.py."""
from engine.cache.eval import main

if __name__ == "__main__":
    raise SystemExit(main())
