"""One way to start a decode: runners, proposers, the k policy and the token stream, then the loop or the
reference decoder (engine/start/decoders.py). The chat, the lab, the doctor, the fp32 proof and the bench call it."""
