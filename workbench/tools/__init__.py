"""Built-in tools for the Responses API's tool loop, behind the `ToolServer` interface.

`Calculator` (arithmetic parsed with `ast`, never `eval`) is the one built-in tool; register
more on a `LocalToolServer` or implement `ToolServer` (`list_tools`, `call`) yourself.
"""

from workbench.tools.base import LocalToolServer, ToolServer, default_tool_server
from workbench.tools.calculator import Calculator, evaluate
from workbench.tools.spec import Tool, ToolError, ToolSpec, parse_arguments

__all__ = ["Calculator", "LocalToolServer", "Tool", "ToolError", "ToolServer", "ToolSpec",
           "default_tool_server", "evaluate", "parse_arguments"]
