"""The built-in headless Huggy stand-in: a program that behaves on the wire like a Unity build.

`launcher.builtin_huggy_path()` gives a file that `UnityEnvironment(file_name=...)` starts like a
Unity player; it runs `python -m envs.standin`, which connects as the gRPC client (`client.py`),
speaks communication protocol 1.5.0 and steps a numpy dog simulation (`sim.py`).
"""
