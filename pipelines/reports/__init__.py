"""Reports people read: the run summary, the plan as text, the HTML page and the citations they carry."""
