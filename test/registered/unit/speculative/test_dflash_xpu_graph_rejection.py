"""DFLASH with intel_xpu decode graphs is refused at argument resolution on XPU,
with the ways that work named; every other combination is left alone."""

import shutil
import tempfile
import unittest
from pathlib import Path

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

# The XPU backends import sgl_kernel, which no CPU runner has.
maybe_stub_sgl_kernel()

from sglang.srt.arg_groups import speculative_hook  # noqa: E402
from sglang.srt.arg_groups.cuda_graph_hook import handle_cuda_graph_config  # noqa: E402
from sglang.srt.arg_groups.platform_hook import handle_xpu_backends  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"
REFUSAL = (
    r"DFLASH with the intel_xpu attention backend cannot run a decode graph on "
    r"XPU .*--attention-backend triton.*drop --cuda-graph-backend-decode"
)


class TestDflashXpuDecodeGraph(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.model_path = cls._tmp.name
        shutil.copy(TINY_CONFIG, f"{cls.model_path}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _resolve(self, device: str = "xpu", **fields) -> None:
        """The hooks in pipeline order: graph config, XPU defaults, DFLASH."""
        args = ServerArgs(
            model_path=self.model_path,
            device=device,
            speculative_algorithm="DFLASH",
            speculative_draft_model_path=self.model_path,
            **fields,
        )
        handle_cuda_graph_config(args)
        handle_xpu_backends(args)
        speculative_hook._handle_dflash(args)

    def test_intel_xpu_with_a_decode_graph_is_refused(self):
        with self.assertRaisesRegex(ValueError, REFUSAL):
            self._resolve(
                attention_backend="intel_xpu", cuda_graph_backend_decode="full"
            )

    def test_the_decode_backend_is_what_counts(self):
        with self.assertRaisesRegex(ValueError, REFUSAL):
            self._resolve(
                attention_backend="triton",
                decode_attention_backend="intel_xpu",
                cuda_graph_backend_decode="full",
            )
        self._resolve(
            attention_backend="intel_xpu",
            decode_attention_backend="triton",
            cuda_graph_backend_decode="full",
        )

    def test_intel_xpu_without_a_decode_graph_runs(self):
        # The XPU default: the decode graph is off unless asked for.
        self._resolve(attention_backend="intel_xpu")
        self._resolve(attention_backend="intel_xpu", disable_decode_cuda_graph=True)

    def test_triton_keeps_its_decode_graph(self):
        self._resolve(attention_backend="triton", cuda_graph_backend_decode="full")

    def test_other_devices_are_not_touched(self):
        self._resolve(
            "cuda", attention_backend="intel_xpu", cuda_graph_backend_decode="full"
        )


if __name__ == "__main__":
    unittest.main()
