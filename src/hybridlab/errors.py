"""User-facing errors.

Anything a user can get wrong (config, data, checkpoint, CLI argument) raises `HybridlabError` with a
one-line message that names the problem and the fix. Entry points (the `hybridlab` CLI and the
workflow scripts) catch it and print that line without a traceback.
"""


class HybridlabError(Exception):
    """A problem the user can fix; its message is one line naming the problem and the fix."""
