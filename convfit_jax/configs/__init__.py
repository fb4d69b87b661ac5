"""Config builders and the blocks they share (as big_vision keeps its config helpers in
`big_vision/configs/`). The files in the repository's `configs/` folder are thin entry
points over these: every one of them works from any directory with only the installed
package, and `--config=configs/x.py:arg=value` passes `arg=value` to `get_config`.
"""
