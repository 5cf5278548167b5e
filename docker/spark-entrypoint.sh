#!/usr/bin/env bash
# Entrypoint of the analytics image. Spark on Kubernetes starts its pods with the command
# `driver ARGS...` or `executor` (settings in SPARK_* environment variables); anything else is
# run as given (`shoal-analytics ...`, `python /opt/shoal/analytics-job.py`).
set -euo pipefail

case "${1:-}" in
driver)
    shift
    # The driver pod runs the application in client mode; spark-submit in cluster mode put it here.
    exec "$SPARK_HOME/bin/spark-submit" \
        --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
        --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
        --deploy-mode client \
        "$@"
    ;;
executor)
    shift
    # JVM options arrive numbered (SPARK_JAVA_OPT_0, _1, ...); keep their order.
    java_opts=()
    while IFS= read -r opt; do
        java_opts+=("$opt")
    done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    classpath="$SPARK_HOME/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}"
    exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
        -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
        -cp "$classpath" \
        org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "$SPARK_DRIVER_URL" \
        --executor-id "$SPARK_EXECUTOR_ID" \
        --cores "$SPARK_EXECUTOR_CORES" \
        --app-id "$SPARK_APPLICATION_ID" \
        --hostname "$SPARK_EXECUTOR_POD_IP" \
        --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
        --podName "$SPARK_EXECUTOR_POD_NAME" \
        "$@"
    ;;
*)
    exec "$@"
    ;;
esac
