// A one-node OpenSearch for differential tests, run in source-file mode on the jars that
// fetch.sh pins (scripts/opensearch/start.sh starts it):
//   java -cp 'LIB/*' SpateOpenSearch HOME_DIR HTTP_PORT TRANSPORT_PORT
// It serves HTTP (the Netty4 transport plugin) on 127.0.0.1:HTTP_PORT with its data and logs
// under HOME_DIR, prints "opensearch ready on 127.0.0.1:PORT" once the HTTP listener is bound,
// and closes the node on SIGTERM.
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.http.HttpServerTransport;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.transport.Netty4Plugin;

public class SpateOpenSearch {
    // Node's constructor that takes plugins from the classpath is protected.
    static final class EmbeddedNode extends Node {
        EmbeddedNode(Settings settings) {
            super(InternalSettingsPreparer.prepareEnvironment(settings, java.util.Map.of(), null, () -> "spate-diff"),
                List.of(Netty4Plugin.class), true);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: SpateOpenSearch HOME_DIR HTTP_PORT TRANSPORT_PORT");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("data"));
        Files.createDirectories(home.resolve("logs"));
        Settings settings = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "spate-differential")
            .put("node.name", "spate-diff")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            .put("transport.port", args[2])
            // Reports 7.10.2 as Elasticsearch clients and Grafana expect.
            .put("compatibility.override_main_response_version", true)
            // A nearly full shared disk must not turn the test index read-only.
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .build();
        Node node = new EmbeddedNode(settings);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
            } catch (Exception e) {
                e.printStackTrace();
            }
        }));
        node.start();
        var address = node.injector().getInstance(HttpServerTransport.class).boundAddress().publishAddress();
        System.out.println("opensearch ready on " + address);
        System.out.flush();
        Thread.currentThread().join();  // until SIGTERM (the shutdown hook closes the node)
    }
}
