"""Built-in SGLang adaptive-speculation presets (JSON files beside this module)."""
