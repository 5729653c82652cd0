"""Entry file for spark-submit, which runs a file rather than a console script:

    spark-submit --master spark://host:7077 \\
        --archives ringmaster-env.tar.gz#environment \\
        --conf spark.pyspark.python=./environment/bin/python \\
        "$(python -c 'import runtime.spark.submit as m; print(m.__file__)')" run -c config.toml

Arguments are those of `ringmaster spark` (run / backfill ...).
"""

from __future__ import annotations

import sys

from runtime.cli.spark_commands import spark

if __name__ == "__main__":
    spark.main(args=sys.argv[1:], prog_name="ringmaster spark")
