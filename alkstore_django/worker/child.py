"""The entry point of a process-pool child: ``python -m alkstore_django.worker.child``.

Kept apart from ``children.py`` so that nothing imports a model before
Django is set up in the new interpreter.
"""

from __future__ import annotations

if __name__ == "__main__":
    import django

    django.setup()
    from alkstore_django.worker.children import child_main

    child_main()
