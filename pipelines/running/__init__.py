"""Running a release on Beam: runner flags and options, process settings, signals and progress lines."""
