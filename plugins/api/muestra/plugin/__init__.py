"""The module muestra plugin authors import.

A plugin is a module (or package) with functions marked `@hookimpl`, published under the
entry-point group `muestra`:

    [project.entry-points.muestra]
    my_sampler = "my_package.plugin"
"""

from muestra.plugin.hookspecs import hookimpl, hookspec

PROJECT_NAME = "muestra"
ENTRY_POINT_GROUP = "muestra"

__all__ = ["ENTRY_POINT_GROUP", "PROJECT_NAME", "hookimpl", "hookspec"]
