"""The toolkit's hooks as configs/_base_/toolkit_hooks.py declares them, the one list of them: the
runtime bases inherit that file, and ``run_config.declare_hooks`` reads it for configs that do not.

The file is found beside the package: in the checkout (an editable install) at configs/, in an
installed wheel at xcit_dense/.mim/configs/ (setup.py copies it there, as openmim expects).
"""
from functools import lru_cache
from pathlib import Path
from typing import Dict

from mmengine.config import Config

DECLARATION = Path('_base_') / 'toolkit_hooks.py'  # under the configs folder


def declaration_path() -> Path:
    """configs/_base_/toolkit_hooks.py of the installed wheel or of the checkout."""
    package = Path(__file__).resolve().parents[2]
    candidates = [package / '.mim' / 'configs' / DECLARATION, package.parent / 'configs' / DECLARATION]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f'the toolkit\'s hook declaration is missing: none of {", ".join(map(str, candidates))} '
                            'exists (reinstall the package)')


@lru_cache(maxsize=1)
def _declared() -> Dict[str, str]:
    hooks = Config.fromfile(str(declaration_path()), import_custom_modules=False).default_hooks
    return {name: entry['type'] for name, entry in hooks.items() if 'type' in entry}


def toolkit_hooks() -> Dict[str, str]:
    """The ``default_hooks`` name of each toolkit hook and its type, in declaration order (the
    ``checkpoint`` entry, which only sets MMEngine's hook's writes, is not one of them)."""
    return dict(_declared())
