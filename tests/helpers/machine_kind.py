"""Print the machine kind ``detect_machine`` sees for the CPU. torch fixes its CPU capability
(``ATEN_CPU_CAPABILITY``) when it loads, so a test that sets it runs ``python -m tests.helpers.machine_kind``
in a fresh interpreter under that environment (tests/costs/test_costmodel.py)."""
from __future__ import annotations

from engine.models.hardware import detect_machine

if __name__ == "__main__":
    print(detect_machine("cpu").kind)
