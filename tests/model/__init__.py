"""The stateful model test of delivery (tests/test_model_delivery.py, docs/testing.md).

world.py drives the real processes and records what each consumer is pushed; model.py
knows what must be true and checks a snapshot of the Maildir and the index against it;
machine.py is the Hypothesis state machine that draws the operations; soak.py runs it
for long.
"""
