"""XPU rejects host-KV-pool opt-ins at argument resolution, naming the flag."""

import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from sglang.srt.arg_groups import pipeline
from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

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


class TestXpuHostPoolRejection(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _args(self, device: str, **fields) -> ServerArgs:
        return ServerArgs(model_path=self._tmp.name, device=device, **fields)

    def test_each_opt_in_is_rejected_on_xpu_naming_its_flag(self):
        for flag, fields in OPT_INS.items():
            with self.subTest(flag=flag):
                with self.assertRaises(ValueError) as ctx:
                    handle_cache_compatibility(self._args("xpu", **fields))
                message = str(ctx.exception)
                self.assertTrue(message.startswith(f"{flag} is not supported on XPU"))
                self.assertIn("binds its page movers (kvcacheio) only on CUDA", message)

    def test_cpu_device_on_an_xpu_host_is_unaffected(self):
        # Keyed on the resolved device, not the hardware probe: --device cpu on
        # an XPU machine keeps every opt-in.
        from sglang.srt.runtime_context import override_platform

        with override_platform(is_xpu=True, is_cuda=False, is_hip=False):
            for flag, fields in OPT_INS.items():
                with self.subTest(flag=flag):
                    handle_cache_compatibility(self._args("cpu", **fields))

    def test_same_opt_ins_pass_on_cuda(self):
        for flag, fields in OPT_INS.items():
            with self.subTest(flag=flag):
                handle_cache_compatibility(self._args("cuda", **fields))

    def test_xpu_without_opt_ins_passes(self):
        handle_cache_compatibility(self._args("xpu"))
        handle_cache_compatibility(
            self._args(
                "xpu",
                disaggregation_mode="decode",
                disaggregation_decode_retraction_backup="cpu_tensor",
            )
        )

    def test_full_resolution_rejects_hierarchical_cache_on_xpu(self):
        # resolve_once() asks the device for its memory size; a CPU runner has none.
        args = self._args("xpu", enable_hierarchical_cache=True)
        with mock.patch.object(
            pipeline, "get_device_memory_capacity", return_value=24576
        ):
            with self.assertRaisesRegex(
                ValueError, r"^--enable-hierarchical-cache is not supported on XPU"
            ):
                args.resolve_once()


if __name__ == "__main__":
    unittest.main()
