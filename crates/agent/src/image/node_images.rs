//! The Node's `status.images` (pure): the largest images first, up to `nodeStatusMaxImages`
//! (50), each with up to 5 names, digests before tags, as upstream.

use k8s_openapi::api::core::v1::ContainerImage;

use gantry_cri::api;

/// Upstream `nodeStatusMaxImages` default.
pub const MAX_IMAGES: usize = 50;
/// Upstream `MaxNamesPerImageInNodeStatus`.
pub const MAX_NAMES_PER_IMAGE: usize = 5;

pub fn node_images(images: &[api::Image], max: usize) -> Vec<ContainerImage> {
    let mut sorted: Vec<&api::Image> = images.iter().collect();
    sorted.sort_by_key(|image| std::cmp::Reverse(image.size));
    sorted
        .into_iter()
        .take(max)
        .map(|image| {
            let names: Vec<String> =
                image.repo_digests.iter().chain(&image.repo_tags).take(MAX_NAMES_PER_IMAGE).cloned().collect();
            ContainerImage { names: Some(names), size_bytes: Some(image.size as i64) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tag: &str, size: u64) -> api::Image {
        api::Image {
            id: format!("sha256:{tag}"),
            repo_tags: vec![format!("example.com/{tag}:v1")],
            repo_digests: vec![format!("example.com/{tag}@sha256:d")],
            size,
            ..Default::default()
        }
    }

    #[test]
    fn largest_first_capped_with_digests_then_tags() {
        let images = vec![image("small", 1), image("big", 300), image("mid", 20)];
        let listed = node_images(&images, 2);
        let names: Vec<Vec<String>> = listed.iter().map(|i| i.names.clone().unwrap()).collect();
        assert_eq!(
            names,
            vec![
                vec!["example.com/big@sha256:d".to_string(), "example.com/big:v1".to_string()],
                vec!["example.com/mid@sha256:d".to_string(), "example.com/mid:v1".to_string()],
            ]
        );
        assert_eq!(listed[0].size_bytes, Some(300));
    }

    #[test]
    fn at_most_five_names_per_image() {
        let mut many = image("many", 1);
        many.repo_tags = (0..10).map(|i| format!("example.com/many:{i}")).collect();
        assert_eq!(node_images(&[many], MAX_IMAGES)[0].names.as_ref().unwrap().len(), MAX_NAMES_PER_IMAGE);
    }
}
