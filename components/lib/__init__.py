"""The code the steps share. Steps import this library, never each other; it imports no step and no
``pipelines`` module (``tests/test_layout.py`` keeps the rule)."""
