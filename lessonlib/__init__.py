"""lessonlib: the measurement and calculation helpers of *What Training Costs*.

One concept a module. Calculation helpers are pure Python (no torch needed);
measurement helpers use PyTorch on the reader's device. Import the module you
need, e.g. ``from lessonlib import memory``.
"""

__version__ = "0.1.0"
