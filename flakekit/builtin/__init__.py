"""flakekit's own plugins: registered through the same hooks a third party uses."""
