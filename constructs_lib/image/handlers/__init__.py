"""Lambda handler code, packaged as-is (standard library and boto3 only: no constructs_lib imports)."""
