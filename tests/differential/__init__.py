"""The differential suite's toolkit: one corpus of requests, sent to a real ``vllm serve`` and to ``llmfleet sim
serve`` configured alike, and the field-by-field comparison of their answers (``tests/vllm/test_differential.py``
runs it on both engines; the tests here check the toolkit itself and the documented list of differences)."""
