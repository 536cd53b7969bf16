"""Precision recipes: which number format each role of a weight and an activation takes, in bytes.

Pure Python (no torch). The one vocabulary of precisions that ``calc`` and
``measure`` share (:data:`PRECISIONS`); the measured counterpart is
:mod:`lessonlib.measure.precision`.

A *recipe* fixes the bytes per parameter of four roles and the bytes of one
stored activation value:

* weights:          the copy that forward and backward read
* gradients:        the buffer backward writes
* master copy:      a separate fp32 copy that the optimizer updates (0: none)
* optimizer state:  bytes of ONE running value (Adam keeps two, momentum one)
* activation:       bytes of one value saved for backward (one matrix-product input)

The recipes (``name``: weights + gradients + master, state value, activation):

=========================  =====================================================
``"fp32"``                 4 + 4 + 0, state 4, activation 4
``"bf16_master"``          2 + 2 + 4, state 4, activation 2 (bf16 compute, fp32 master)
``"bf16_master_fp32_grads"`` 2 + 4 + 4, state 4, activation 2 (Megatron: fp32 gradient buffers)
``"bf16"``                 2 + 2 + 0, state 2, activation 2 (pure bf16: no master copy)
``"fp16_master"``          2 + 2 + 4, state 4, activation 2 (fp16 with loss scaling)
``"fp8"``                  2 + 2 + 4, state 4, activation 1 (e4m3 matrix-product inputs
                           saved for backward; e5m2 gradients in flight; bf16 weights
                           and gradients, fp32 master)
=========================  =====================================================

With Adam that is 16, 16, 18, 8, 16 and 16 bytes per parameter of state. FP8
saves in what flows through the matrix products (1-byte activations), not in
the state: the master copy and the optimizer state stay, and the weights'
1-byte e4m3 copy for the products (``weights_in_flight``) comes on top, twice
with a transposed copy for backward: :meth:`Recipe.step_bytes_per_param`, 17 or 18.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import choice as check_choice, flag as check_flag

#: The precisions, one name each (CONTRIBUTING's word table).
PRECISIONS = ("fp32", "bf16_master", "bf16_master_fp32_grads", "bf16", "fp16_master", "fp8")

#: Names the course used before this vocabulary, still accepted: "mixed" meant bf16 compute
#: with an fp32 master copy (``precision_name`` turns it into "bf16_master").
FORMER_NAMES = {"mixed": "bf16_master"}

#: Running values per parameter each optimizer keeps between steps ("adamw" is Adam's
#: state with decoupled weight decay: the same two averages).
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter (weights, gradients, master_weights), bytes per optimizer-state
    value (``state_value``) and bytes per stored activation value (``activation``) of a precision.

    ``compute`` names the format of the matrix products and ``note`` says what the recipe is.
    """

    name: str
    weights: int
    gradients: int
    master_weights: int
    state_value: int
    activation: int
    compute: str
    note: str
    weights_in_flight: int = 0  # bytes per parameter of a copy of the weights in the products' format (fp8: 1)

    def state_bytes(self, optimizer: str = "adam") -> int:
        """Bytes of optimizer state per parameter for ``optimizer`` under this recipe."""
        check_choice("optimizer", optimizer, OPTIMIZER_STATES)
        return OPTIMIZER_STATES[optimizer] * self.state_value

    def bytes_per_param(self, optimizer: str = "adam") -> int:
        """Training-state bytes per parameter: weights + gradients + master copy + optimizer state."""
        return self.weights + self.gradients + self.master_weights + self.state_bytes(optimizer)

    def step_bytes_per_param(self, optimizer: str = "adam", transposed: bool = False) -> int:
        """Bytes per parameter a step holds: the state plus ``weights_in_flight``, twice that with ``transposed``
        (a second, transposed copy for backward, as FP8 products on Hopper GPUs take only one operand layout).

        >>> recipe("fp8").step_bytes_per_param(), recipe("fp8").step_bytes_per_param(transposed=True)
        (17, 18)
        """
        copies = 2 if check_flag("transposed", transposed) else 1
        return self.bytes_per_param(optimizer) + copies * self.weights_in_flight


RECIPES = {
    "fp32": Recipe("fp32", 4, 4, 0, 4, 4, "fp32",
                   "everything in 32 bits; the weights are their own master copy"),
    "bf16_master": Recipe("bf16_master", 2, 2, 4, 4, 2, "bf16",
                          "bf16 forward and backward on a bf16 copy of fp32 master weights"),
    "bf16_master_fp32_grads": Recipe("bf16_master_fp32_grads", 2, 4, 4, 4, 2, "bf16",
                                     "as bf16_master, gradients accumulated in fp32 buffers (Megatron-LM)"),
    "bf16": Recipe("bf16", 2, 2, 0, 2, 2, "bf16",
                   "pure bf16: weights, gradients and optimizer state in bf16, no master copy"),
    "fp16_master": Recipe("fp16_master", 2, 2, 4, 4, 2, "fp16",
                          "fp16 forward and backward with loss scaling, fp32 master weights"),
    "fp8": Recipe("fp8", 2, 2, 4, 4, 1, "fp8 (e4m3 forward, e5m2 gradients)",
                  "per-tensor scaled FP8 matrix products on bf16 weights with an fp32 master copy",
                  weights_in_flight=1),  # torch.float8_e4m3fn's itemsize: one e4m3 copy of each weight
}
assert tuple(RECIPES) == PRECISIONS


def precision_name(precision) -> str:
    """The vocabulary's name for ``precision`` (a former name such as "mixed" is translated).

    >>> precision_name("mixed")
    'bf16_master'
    """
    precision = FORMER_NAMES.get(precision, precision) if isinstance(precision, str) else precision
    return check_choice("precision", precision, PRECISIONS)


def recipe(precision: str = "bf16_master") -> Recipe:
    """The :class:`Recipe` of ``precision`` (one of :data:`PRECISIONS`).

    >>> recipe("bf16_master_fp32_grads").bytes_per_param("adam")
    18
    """
    return RECIPES[precision_name(precision)]
