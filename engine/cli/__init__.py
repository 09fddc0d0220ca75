"""`voxshard-engine`: the headless command line, a thin layer over the engine API.

Each area of the engine adds its sub-commands in its own module (see
`COMMAND_MODULES`): a module exposes `register(subparsers)` and every command
function takes `(args, emitter)` and returns a JSON-able result dict.
"""
