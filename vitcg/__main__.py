"""``python -m vitcg`` is the ``vitcg`` command."""

from .cli import main

main()
