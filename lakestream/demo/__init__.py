"""The end-to-end demo (`lakestream demo`, `make demo`): a shop database streamed into Iceberg."""

from lakestream.demo.runner import DemoResult, DemoSettings, run_demo

__all__ = ["DemoResult", "DemoSettings", "run_demo"]
