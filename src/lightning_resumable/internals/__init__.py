"""The one home of each third-party private name (torch's, torchdata's, Lightning's), each with an
internals test against the versions CI installs."""
