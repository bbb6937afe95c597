"""XPU rejects host-KV-pool opt-ins at argument resolution, naming the flag."""

import importlib.util
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import device_memory_mb  # noqa: E402

register_cpu_ci(est_time=20, suite="base-a-test-cpu")

# A model folder needs only a config.json: no weights, no tokenizer.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"

# Each opt-in with the companions that keep earlier, unrelated checks quiet.
OPT_INS = {
    "--enable-hierarchical-cache": dict(enable_hierarchical_cache=True),
    "--disaggregation-decode-enable-offload-kvcache": dict(
        disaggregation_mode="decode",
        disaggregation_decode_enable_offload_kvcache=True,
        hicache_storage_backend="file",
    ),
    "--disaggregation-decode-retraction-backup=host_pool": dict(
        disaggregation_mode="decode",
        disaggregation_decode_retraction_backup="host_pool",
    ),
}

# From 0.5.23 upstream binds host-pool page movers on XPU, so there is nothing to
# reject: 0004 is retired there and these tests speak for 0.5.20 to 0.5.22.
XPU_MOVERS = "sglang.srt.mem_cache.pool_host._kvcacheio"
SUPERSEDED = importlib.util.find_spec(XPU_MOVERS) is not None


@unittest.skipIf(
    SUPERSEDED,
    f"this sglang gives XPU its own host-pool page movers ({XPU_MOVERS}): "
    "0004 is retired here, nothing is rejected",
)
class TestXpuHostPoolRejection(CustomTestCase):
    """`ServerArgs(...).resolve_once()`, the entry point every release keeps."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _resolve(self, device: str, **fields) -> ServerArgs:
        args = ServerArgs(model_path=self._tmp.name, device=device, **fields)
        # The hardware probe says nothing: only the resolved device may decide.
        with (
            override_platform(is_xpu=False, is_cuda=False, is_hip=False),
            device_memory_mb(24576),
        ):
            args.resolve_once()
        return args

    def test_each_opt_in_is_rejected_on_xpu_naming_its_flag(self):
        for flag, fields in OPT_INS.items():
            with self.subTest(flag=flag):
                with self.assertRaises(ValueError) as ctx:
                    self._resolve("xpu", **fields)
                message = str(ctx.exception)
                self.assertTrue(
                    message.startswith(f"{flag} is not supported on XPU"), message
                )
                self.assertIn("binds its page movers (kvcacheio) only on CUDA", message)

    def test_cpu_device_on_an_xpu_host_is_unaffected(self):
        # Keyed on the resolved device, not the hardware probe: --device cpu on
        # an XPU machine keeps every opt-in.
        for flag, fields in OPT_INS.items():
            with self.subTest(flag=flag):
                args = ServerArgs(model_path=self._tmp.name, device="cpu", **fields)
                with (
                    override_platform(is_xpu=True, is_cuda=False, is_hip=False),
                    device_memory_mb(24576),
                ):
                    args.resolve_once()

    def test_xpu_without_opt_ins_resolves(self):
        self._resolve("xpu")
        self._resolve(
            "xpu",
            disaggregation_mode="decode",
            disaggregation_decode_retraction_backup="cpu_tensor",
        )


if __name__ == "__main__":
    unittest.main()
