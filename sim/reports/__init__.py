"""Reports: loading results folders, figures, the diagnosis in words, HTML/Markdown rendering."""
