"""The results folder: its columns (schema), the writers sweep and validate append to, and the pandas reader every
command that consumes results uses."""
