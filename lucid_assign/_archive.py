"""The commit of a source tree made by ``git archive`` (.gitattributes marks this file export-subst, so the archive
writes the commit below); in a checkout it stays unexpanded and the commit comes from git."""

COMMIT = "$Format:%h$"
