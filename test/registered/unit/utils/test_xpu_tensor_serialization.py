"""Weight updates from tensors serialize XPU tensors by value: torch has no IPC for
XPU, so MultiprocessingSerializer sends a host copy any process can load."""

import json
import subprocess
import sys
import unittest
from pathlib import Path

import torch
from sglang.srt.utils.common import MultiprocessingSerializer
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import XpuTensor  # noqa: E402

register_cpu_ci(est_time=30, suite="base-a-test-cpu")

# The receiving side in a process of its own (the scheduler, a Ray actor): it
# shares no memory, file descriptors or authkey with the sender.
RECEIVER = """
import json, sys
from sglang.srt.utils.common import MultiprocessingSerializer
data = sys.stdin.buffer.read()
# A str payload (output_str=True, as the HTTP engine sends it) is base64 text.
named = MultiprocessingSerializer.deserialize(
    data.decode() if sys.argv[1] == "str" else data
)
print(json.dumps([
    [name, t.device.type, t.tolist(), t.requires_grad] for name, t in named
]))
"""


def received(payload: bytes | str) -> list:
    """What a separate process gets from `payload`."""
    as_str = isinstance(payload, str)
    done = subprocess.run(
        [sys.executable, "-c", RECEIVER, "str" if as_str else "bytes"],
        input=payload.encode() if as_str else payload,
        capture_output=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise AssertionError(done.stderr.decode(errors="replace")[-2000:])
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def on_xpu(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as torch reports it on an XPU (its data stays on this CPU)."""
    return tensor.as_subclass(XpuTensor)


class TestXpuTensorsGoByValue(CustomTestCase):
    def test_a_separate_process_loads_the_weights(self):
        weight = on_xpu(torch.arange(6.0).reshape(2, 3))
        payload = MultiprocessingSerializer.serialize([("w", weight)])
        self.assertEqual(
            received(payload), [["w", "cpu", [[0, 1, 2], [3, 4, 5]], False]]
        )

    def test_views_and_grad_flags_survive(self):
        base = torch.arange(12.0).reshape(3, 4)
        transposed = on_xpu(base)[1:, ::2].t()  # an offset, strided view
        grad = on_xpu(torch.tensor([1.5, -2.0])).requires_grad_()
        payload = MultiprocessingSerializer.serialize(
            [("view", transposed), ("grad", grad)], output_str=True
        )
        self.assertIsInstance(payload, str)
        got = received(payload)
        self.assertEqual(got[0], ["view", "cpu", [[4, 8], [6, 10]], False])
        self.assertEqual(got[1], ["grad", "cpu", [1.5, -2.0], True])

    def test_the_payload_carries_the_data(self):
        weight = on_xpu(torch.zeros(1 << 16))
        payload = MultiprocessingSerializer.serialize([("w", weight)])
        self.assertGreaterEqual(len(payload), weight.nbytes)


class TestCpuTensorsAreStillShared(CustomTestCase):
    def test_a_cpu_tensor_goes_by_file_descriptor_not_by_copy(self):
        weight = torch.ones(1 << 16)
        payload = MultiprocessingSerializer.serialize([("w", weight)])
        self.assertLess(len(payload), 4096)
        ((name, back),) = MultiprocessingSerializer.deserialize(payload)
        self.assertEqual(name, "w")
        self.assertTrue(torch.equal(back, weight))


if __name__ == "__main__":
    unittest.main()
