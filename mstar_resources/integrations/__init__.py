"""Engine integrations: the library inside an engine's process, through the engine's plugin seams.

The top floor of the package: nothing else in it imports these modules, and each imports its
engine only once it is enabled (``vllm``: vLLM's ``vllm.general_plugins`` entry point).
"""
